"""One router per resource; :mod:`server.admin.main` includes them."""
