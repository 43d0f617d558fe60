"""TensorRT 10's ONNX parser operator support, as data (onnx-tensorrt docs/operators.md, TensorRT 10.x).

Only the default ONNX domain; anything else (ai.onnx.ml, custom domains) needs a TensorRT plugin. Ops marked
in the notes run with restrictions the parser enforces at build time.
"""

from __future__ import annotations

SOURCE = "https://github.com/onnx/onnx-tensorrt/blob/main/docs/operators.md (TensorRT 10)"

_OPS = """
    Abs Acos Acosh Add AffineGrid And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
    Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BlackmanWindow Cast CastLike Ceil Celu Clip
    Compress Concat ConcatFromSequence Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DeformConv
    DepthToSpace DequantizeLinear Div Dropout DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand EyeLike
    Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool
    Greater GreaterOrEqual GridSample GroupNormalization HammingWindow HannWindow HardSigmoid HardSwish Hardmax
    Identity If ImageScaler InstanceNormalization IsInf IsNaN LRN LSTM LayerNormalization LeakyRelu Less
    LessOrEqual Log LogSoftmax Loop LpNormalization LpPool MatMul MatMulInteger Max MaxPool MaxRoiPool
    MaxUnpool Mean MeanVarianceNormalization Min Mish Mod Mul Multinomial Neg NonMaxSuppression NonZero Not
    OneHot Or PRelu Pad ParametricSoftplus Pow QuantizeLinear RNN RandomNormal RandomNormalLike RandomUniform
    RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean
    ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign Round STFT
    ScaledTanh Scan Scatter ScatterElements ScatterND Selu SequenceAt SequenceConstruct SequenceEmpty
    SequenceErase SequenceInsert SequenceLength Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax Softplus
    Softsign SpaceToDepth Split SplitToSequence Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK
    Transpose Trilu Unsqueeze Upsample Where Xor
"""
SUPPORTED: frozenset[str] = frozenset(_OPS.split())

NOTES: dict[str, str] = {
    "Loop": "trip count and condition must be resolvable; scan outputs supported",
    "If": "the condition must be a build-time constant unless both branches have the same output shapes",
    "NonZero": "output shape is data-dependent (needs TensorRT 8.5+ data-dependent shapes)",
    "Resize": "only nearest/linear/cubic modes; some coordinate transforms unsupported",
    "Pad": "wrap mode unsupported",
    "TopK": "K must be a build-time constant ≤ 3840",
}

UNSUPPORTED_REASON = "not in TensorRT 10's ONNX parser support list (needs a plugin)"
