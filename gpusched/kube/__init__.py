"""Everything that talks to the Kubernetes API server, and nothing else does.

``convert`` turns API JSON into the typed records of ``gpusched.state``;
``client`` builds the API client with a bounded request rate; ``watch`` keeps
lists of objects current; ``binder`` writes Bindings, Events and conditions;
``leader`` holds the Lease; ``configmap`` follows the solver configuration.
"""
