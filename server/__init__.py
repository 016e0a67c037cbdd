"""The sidecar daemon and the ``kvstore`` command line. Imports connector and kvstore, never the
other way round."""
