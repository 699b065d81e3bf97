"""``hetmm.v1.Inspection`` over gRPC: ``inspection.proto``, its generated modules, the replicas that
serve it (``service.py``), the application (``app.py``), a client (``client.py``) and the HTTP ingress's
refusal of calls that reach it while the gRPC application is not running (``standin.py``).

Regenerate the generated modules after editing the ``.proto``: ``python -m hetmm_ray.serve.grpc.protoc``.
The generated modules import only grpc and protobuf; Serve's gRPC proxy imports the servicer
function (``config.GRPC_SERVICER``) by its import path.
"""
