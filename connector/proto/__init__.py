"""The daemon's wire format: ``kvstore_daemon.proto`` and its generated stubs (regenerate with
``python -m connector.proto.generate``; a test checks the committed files match)."""
