"""Generated protobuf and gRPC stubs for proto/grpcgrade/v1/grading.proto and admin.proto (`make proto`
regenerates)."""
