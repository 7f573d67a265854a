"""Generated protobuf and gRPC stubs for proto/grpcgrade/v1/grading.proto (`make proto` regenerates)."""
