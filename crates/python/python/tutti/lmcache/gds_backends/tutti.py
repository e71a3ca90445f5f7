"""LMCache GDS backend module ``tutti``.

LMCache imports this file as ``lmcache.v1.gpu_connector.gds_backends.tutti``
once ``tutti.lmcache.install()`` has added this folder to that package's
``__path__``; the module's name is the backend's configuration name, and
LMCache wants a ``Backend`` class from it. Nothing else belongs here.
"""

from tutti.lmcache.gds import TuttiGDSBackend as Backend

__all__ = ["Backend"]
