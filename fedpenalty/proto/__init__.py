"""Generated gRPC code of the owner protocol (``protos/fedpenalty/v1/owner.proto``):
``owner_pb2`` (messages) and ``owner_pb2_grpc`` (service stubs).

Do not edit the ``owner_pb2*`` files: regenerate them with ``python -m fedpenalty.proto.generate``.
"""
