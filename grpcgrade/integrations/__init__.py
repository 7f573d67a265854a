"""Trainer integrations: each module speaks one trainer's reward convention (TRL, veRL) over the client.

They import only the client side (grpcio, protobuf), so a trainer's environment needs no grader dependency.
"""
