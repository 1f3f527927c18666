"""What the scheduler knows about the cluster between watch events and solves.

``records`` are the typed views of API objects that ``kube.convert`` produces;
``cache`` accounts every bound and assumed pod against the node inventory and
freezes a ``Snapshot`` for each batch.  Nothing here talks to the API server.
"""
