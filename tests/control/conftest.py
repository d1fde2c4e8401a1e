from tests.harness import network  # noqa: F401  (the namespaced-hosts fixture)
