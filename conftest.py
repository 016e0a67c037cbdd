"""Root conftest: registers the fixture plugins shared by the whole suite (pytest only honours
``pytest_plugins`` here)."""

pytest_plugins = ["tests.redis_servers"]
