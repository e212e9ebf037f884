"""`gridgate demo`: the director against simulated WMS servers, with admission by a real token
daemon. An application of core and of the plugins' stand-ins (``gridgate.plugins.wms_glite.sim``,
``gridgate.plugins.lsf_proxy.sim``), so it lives outside every plugin: no plugin imports
another plugin for it."""
