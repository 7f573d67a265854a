"""The service's network faces: the HTTP endpoints beside the gRPC server."""
