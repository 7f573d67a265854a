"""A plugin that fails at import, as a package with a missing dependency does."""

import grpcgrade_dependency_that_does_not_exist  # noqa: F401
