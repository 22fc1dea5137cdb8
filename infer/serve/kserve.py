"""The KServe v2 (Open Inference Protocol) face of `cnninfer serve`, so that standard clients
(tritonclient.http, tritonclient.grpc, perf_analyzer) work unmodified.

REST, beside /v1:
    GET  /v2, /v2/health/live, /v2/health/ready, /v2/models/cnninfer[/ready]
    POST /v2/models/cnninfer[/versions/1]/infer   JSON tensors, or the binary tensor data extension
                                                  (Inference-Header-Content-Length)
gRPC: inference.GRPCInferenceService (the service definitions tritonclient[grpc] ships):
    ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer

The model is `cnninfer`, version 1: input `x` (N, H, W, C), FP32 or UINT8 (any other number type
is taken too and converted as the command line converts files); outputs `labels` INT64 (N) and
`scores` FP32 (N, classes), export-onnx's names. Requests go through the same checks, bounds and
batcher as /v1/predict; errors are one line about the request.
"""
import json
import math

import numpy as np

from . import images
from .. import network
from ..errors import InputError

MODEL = "cnninfer"
VERSION = "1"
INPUT = "x"
OUTPUTS = ("labels", "scores")
HEADER_LENGTH = "inference-header-content-length"
DATATYPES = {"FP32": np.float32, "UINT8": np.uint8, "FP16": np.float16, "FP64": np.float64, "INT8": np.int8,
             "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "UINT16": np.uint16, "UINT32": np.uint32,
             "UINT64": np.uint64}
NAMES = {np.dtype(v): k for k, v in DATATYPES.items()}


class BadRequest(InputError):
    """A v2 request that does not follow the protocol or the model (HTTP 400, gRPC INVALID_ARGUMENT)."""


def unknown_model(name, version=""):
    """Why model `name` at `version` ("" any) is not served here, or None."""
    if name == MODEL and version in ("", VERSION):
        return None
    return f"model {name!r}: this server serves {MODEL!r}, version {VERSION}"


def server_metadata(version):
    return {"name": MODEL, "version": version, "extensions": ["binary_tensor_data"]}


def model_metadata(model, sha256):
    h, w, c = network.image_shape(model)
    classes = model.fc2.shape[1]
    out = {"name": MODEL, "versions": [VERSION], "platform": "cnninfer",
           "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [-1, h, w, c]}],
           "outputs": [{"name": "labels", "datatype": "INT64", "shape": [-1]},
                       {"name": "scores", "datatype": "FP32", "shape": [-1, classes]}]}
    if sha256:
        out["parameters"] = {"sha256": sha256}
    return out


def tensor(name, datatype, shape, model, raw=None, data=None):
    """The images of input `name` (N, H, W, C), from its raw little-endian bytes or its JSON data,
    checked as a .npy body is (shape against the model, values finite)."""
    if name != INPUT:
        raise BadRequest(f"input {name!r}: the model's one input is {INPUT!r}")
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise BadRequest(f"input {INPUT!r}: datatype {datatype!r} is not a number type ({', '.join(DATATYPES)})")
    shape = tuple(shape)
    if len(shape) != 4 or any(not isinstance(d, int) or d < 0 for d in shape):
        raise BadRequest(f"input {INPUT!r}: shape {list(shape)}, expected (N, H, W, C) images")
    network.geometry(model, (max(shape[0], 1),) + shape[1:], f"input {INPUT!r}", None)
    count = math.prod(shape)
    if raw is not None:
        dtype = np.dtype(dtype).newbyteorder("<")
        if len(raw) != count * dtype.itemsize:
            raise BadRequest(f"input {INPUT!r}: {len(raw)} bytes of data for a {datatype} tensor of shape "
                          f"{list(shape)} ({count * dtype.itemsize} bytes)")
        x = np.frombuffer(raw, dtype, count).reshape(shape)
    else:
        try:
            x = np.asarray(data, dtype=dtype)
        except (TypeError, ValueError, OverflowError):
            raise BadRequest(f"input {INPUT!r}: its data are not {datatype} numbers") from None
        if x.size != count:
            raise BadRequest(f"input {INPUT!r}: {x.size} values for a tensor of shape {list(shape)} ({count})")
        x = x.reshape(shape)
    return images.checked(x, f"input {INPUT!r}")


def parse_rest(body, header_length):
    """(images, outputs wanted {name: binary}, request id) of a v2 REST infer body, read by `model`
    later (tensor): (JSON request, raw bytes of the input or None)."""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadRequest(f"Inference-Header-Content-Length {header_length!r}: not a length within the body's "
                          f"{len(body)} bytes")
        head, tail = body[:int(header_length)], body[int(header_length):]
    else:
        head, tail = body, b""
    try:
        request = json.loads(head)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("body: its inference header is not JSON") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list) or len(request["inputs"]) != 1:
        raise BadRequest(f"body: an inference request has one input, {INPUT!r}")
    given = request["inputs"][0]
    if not isinstance(given, dict):
        raise BadRequest(f"body: input {INPUT!r} is not an object")
    size = (given.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size != len(tail):
            raise BadRequest(f"input {INPUT!r}: binary_data_size {size!r}, but {len(tail)} bytes follow the header")
        raw = tail
    else:
        if tail:
            raise BadRequest(f"body: {len(tail)} bytes after the inference header that no input claims")
        raw = None
        if "data" not in given:
            raise BadRequest(f"input {INPUT!r}: no data and no binary_data_size")
    wanted = outputs_wanted(request)
    return request, given, raw, wanted


def outputs_wanted(request):
    """{output name: binary wanted} of a v2 request (all outputs where it names none)."""
    binary_all = bool((request.get("parameters") or {}).get("binary_data_output", False))
    named = request.get("outputs")
    if not named:
        return {name: binary_all for name in OUTPUTS}
    wanted = {}
    for out in named:
        name = out.get("name") if isinstance(out, dict) else None
        if name not in OUTPUTS:
            raise BadRequest(f"output {name!r}: the model's outputs are {', '.join(OUTPUTS)}")
        wanted[name] = bool((out.get("parameters") or {}).get("binary_data", binary_all))
    return wanted


def rest_answer(labels, scores, wanted, request_id=None):
    """(body, headers) of a v2 REST answer: JSON, with the binary outputs appended after it."""
    outputs, blobs = [], []
    for name, binary in wanted.items():
        a = np.ascontiguousarray(labels, "<i8") if name == "labels" else np.ascontiguousarray(scores, "<f4")
        out = {"name": name, "datatype": NAMES[np.dtype(a.dtype.type)], "shape": list(a.shape)}
        if binary:
            blobs.append(a.tobytes())
            out["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            out["data"] = a.ravel().tolist()
        outputs.append(out)
    answer = {"model_name": MODEL, "model_version": VERSION, "outputs": outputs}
    if request_id is not None:
        answer["id"] = request_id
    head = json.dumps(answer, separators=(",", ":")).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream",
                                    "inference-header-content-length": str(len(head))}


SERVICE = "inference.GRPCInferenceService"
# gRPC: the status an HTTP status maps to (grpc_h2.CODES' names)
GRPC_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED",
              413: "RESOURCE_EXHAUSTED", 415: "UNIMPLEMENTED", 500: "INTERNAL", 503: "UNAVAILABLE",
              504: "DEADLINE_EXCEEDED"}
CONTENTS = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT8": "int_contents", "INT16": "int_contents",
            "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents"}


def grpc_handlers(face):
    """The GRPCInferenceService's methods as grpc_h2 handlers {path: async fn(call) -> the answer's
    bytes}, over `face`, the server's side of a request: face.model, face.sha256,
    face.authorized(token or None), `async with face.message(call) as raw` (the call's one message,
    read within the server's bounds), async face.decode(fn, nbytes) (fn() on a decoder thread where
    large), async face.batch(x, scores) -> (labels, scores) (these raise face.Refused(status,
    message)), face.answered(status, images, seconds), face.failed(what, error)."""
    import time

    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2 as pb

    def refuse(call, status, message):
        call.abort(GRPC_CODES.get(status, "INTERNAL"), message)

    def authorized(call):
        if not face.authorized(call.header("authorization")):
            raise face.Refused(401, "a valid bearer token is required (authorization: Bearer TOKEN)")

    def known(name, version):
        if unknown_model(name, version):
            raise face.Refused(404, unknown_model(name, version))

    def parsed(kind, raw):
        try:
            return kind.FromString(raw)
        except DecodeError:
            raise face.Refused(400, f"the message is not a {kind.DESCRIPTOR.name}") from None

    def method(kind, make, model=False):
        """A method answering make(request) of its one message of type `kind`, or refusing."""
        async def handle(call):
            try:
                authorized(call)
                async with face.message(call) as raw:
                    request = parsed(kind, raw)
                    if model:
                        known(request.name, request.version)
                    return make(request).SerializeToString()
            except face.Refused as e:
                refuse(call, e.status, e.message)
        return handle

    def tensors(ts):
        return [pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                for t in ts]

    server_meta, model_meta = server_metadata(face.version), model_metadata(face.model, face.sha256)

    async def model_infer(call):
        started, count, status, refused, response = time.perf_counter(), 0, 200, None, None
        try:
            authorized(call)
            async with face.message(call) as raw:
                request = parsed(pb.ModelInferRequest, raw)
                known(request.model_name, request.model_version)
                response, count = await infer(request)
        except face.Refused as e:
            status, refused = e.status, e
        except InputError as e:
            status, refused = 400, face.Refused(400, e.message)
        except Exception as e:  # a defect: one line on stderr, INTERNAL, counted
            face.failed("a gRPC request", e)
            status, refused = 500, face.Refused(500, "the server failed to answer this request")
        face.answered(status, count, time.perf_counter() - started)
        if refused is not None:
            refuse(call, refused.status, refused.message)
        return response

    async def infer(request):
        if len(request.inputs) != 1:
            raise face.Refused(400, f"an inference request has one input, {INPUT!r}")
        given = request.inputs[0]
        raw = request.raw_input_contents[0] if request.raw_input_contents else None
        field = CONTENTS.get(given.datatype)
        data = None if raw is not None or field is None else list(getattr(given.contents, field))
        wanted = [o.name for o in request.outputs] or list(OUTPUTS)
        for name in wanted:
            if name not in OUTPUTS:
                raise face.Refused(400, f"output {name!r}: the model's outputs are {', '.join(OUTPUTS)}")
        x = await face.decode(lambda: tensor(given.name, given.datatype, list(given.shape), face.model, raw, data),
                              len(raw) if raw is not None else 8 * len(data or ()))
        labels, scores = (np.empty(0, np.int64), np.empty((0, face.model.fc2.shape[1]), np.float32)) if len(x) == 0 \
            else await face.batch(x, "scores" in wanted)
        arrays = {"labels": np.ascontiguousarray(labels, "<i8"), "scores": scores}
        response = pb.ModelInferResponse(model_name=MODEL, model_version=VERSION, id=request.id)
        for name in wanted:
            a = np.ascontiguousarray(arrays[name], "<i8" if name == "labels" else "<f4")
            out = response.outputs.add()
            out.name, out.datatype = name, NAMES[np.dtype(a.dtype.type)]
            out.shape.extend(a.shape)
            response.raw_output_contents.append(a.tobytes())
        return response.SerializeToString(), len(x)

    methods = {
        "ServerLive": method(pb.ServerLiveRequest, lambda r: pb.ServerLiveResponse(live=True)),
        "ServerReady": method(pb.ServerReadyRequest, lambda r: pb.ServerReadyResponse(ready=True)),
        "ModelReady": method(pb.ModelReadyRequest, lambda r: pb.ModelReadyResponse(
            ready=r.name == MODEL and r.version in ("", VERSION))),
        "ServerMetadata": method(pb.ServerMetadataRequest, lambda r: pb.ServerMetadataResponse(
            name=server_meta["name"], version=server_meta["version"], extensions=server_meta["extensions"])),
        "ModelMetadata": method(pb.ModelMetadataRequest, lambda r: pb.ModelMetadataResponse(
            name=model_meta["name"], versions=model_meta["versions"], platform=model_meta["platform"],
            inputs=tensors(model_meta["inputs"]), outputs=tensors(model_meta["outputs"])), model=True),
        "ModelInfer": model_infer}
    return {f"/{SERVICE}/{name}": handle for name, handle in methods.items()}
