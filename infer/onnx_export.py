"""The model as an ONNX graph (`pip install 'cnninfer[onnx]'`), for runtimes and languages cnninfer
does not reach: input `x` float32 (N, H, W, C) NHWC as the data files hold it, outputs `scores`
(N, classes) float32 and `labels` (N,) int64, the first index of each row's maximum.

Transpose to NCHW, Conv (the weights as OIHW), Relu, AveragePool 2x2 stride 2 (odd sizes floored),
twice; Transpose back to NHWC, so Flatten keeps the (h, w, c) order fc1 was trained on; MatMul,
Relu, MatMul; ArgMax. No biases, as in the model file."""
from .data import atomic
from .errors import InputError

OPSET = 13  # ArgMax's select_last_index (from 12) and every op here; onnxruntime runs it everywhere
# The file format's version: opset 13 needs 7; newer onnx packages write their own newest (14 in
# onnx 1.23), which onnxruntime 1.30 refuses ("Unsupported model IR version: 14, max supported 13").
IR_VERSION = 7


def graph(model, image_shape=None):
    """The ONNX ModelProto of a loaded Model; image_shape (H, W, C) fixes the input's shape (the
    batch stays free), else H and W are free too."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    c = model.conv1.shape[2]
    h, w = (image_shape[0], image_shape[1]) if image_shape else ("H", "W")
    weights = [
        numpy_helper.from_array(np.ascontiguousarray(model.conv1.transpose(3, 2, 0, 1)), "conv1"),
        numpy_helper.from_array(np.ascontiguousarray(model.conv2.transpose(3, 2, 0, 1)), "conv2"),
        numpy_helper.from_array(model.fc1, "fc1"),
        numpy_helper.from_array(model.fc2, "fc2"),
    ]
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [
        helper.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["x_nchw", "conv1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("AveragePool", ["r1"], ["p1"], **pool),
        helper.make_node("Conv", ["p1", "conv2"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("AveragePool", ["r2"], ["p2"], **pool),
        helper.make_node("Transpose", ["p2"], ["p2_nhwc"], perm=[0, 2, 3, 1]),
        helper.make_node("Flatten", ["p2_nhwc"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "fc1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("MatMul", ["a1", "fc2"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["labels"], axis=1, keepdims=0, select_last_index=0),
    ]
    classes = model.fc2.shape[1]
    g = helper.make_graph(
        nodes, "cnninfer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", h, w, c])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", classes]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"])],
        initializer=weights)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="cnninfer",
                              ir_version=IR_VERSION)
    proto.doc_string = f"cnninfer export of {model.path}: x NHWC float32 -> scores, labels"
    return proto


def export(model, out, image_shape=None):
    """Write the graph of `model` (a loaded Model) to `out`, whole (temp file + rename), checked."""
    try:
        import onnx
    except ImportError:
        raise InputError("export-onnx needs the onnx package: pip install 'cnninfer[onnx]'") from None
    proto = graph(model, image_shape)
    onnx.checker.check_model(proto)
    with atomic.replacing(out) as tmp:
        onnx.save(proto, str(tmp))
    return proto
