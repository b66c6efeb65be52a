"""The Fluid 1.8 public names pyfleet does not provide, each with its reason.

One table, :data:`REFUSED` (``"paddle.<module>" -> {name: reason}``), built
from the groups below. :func:`install` puts a placeholder for each refused
name of a module into that module, so that ``from paddle.fluid.layers import
conv2d`` (zero-edit mode) or ``fluid.layers.conv2d`` still resolves, and
*using* it (calling, instantiating, subclassing, reading an attribute of it)
raises :class:`~pyfleet.errors.UnsupportedError` naming the Fluid name and
the reason. ``isinstance(x, placeholder)`` is False. Refused names are never
in a module's ``__all__``. ``docs/fleet.md`` lists them (``python
tools/fluid_census.py --report`` prints that section).
"""

from pyfleet.errors import UnsupportedError

__all__ = ["REFUSED", "install", "is_refused", "placeholder", "refuse", "refused_module_getattr"]

GPU = "a GPU/CUDA feature: pyfleet trains on CPUs"
DYGRAPH = ("dygraph (imperative) mode: pyfleet runs Fluid's static-graph programs only "
           "(Executor.run of a Program)")
VISION = ("an image, detection or vision layer: not part of pyfleet's CTR and "
          "recommendation layer set (docs/layers.md)")
CONTROL = ("control flow with sub-blocks and tensor arrays (While, cond, Switch, ...): a "
           "pyfleet program is one block of operators")
RNN = ("a recurrent network, RNN cell or sequence decoder: not part of pyfleet's layer set; "
       "pool sequences with sequence_pool")
SEQ = ("a LoD sequence op beyond sequence_pool: pyfleet's LoD values are one level of id "
       "sequences, pooled per sequence")
DIST = "a probability distribution: not part of pyfleet's layer set"
NLP = ("a sequence-labelling, speech or translation op (CRF, CTC, edit distance, beam "
       "search): not part of pyfleet's layer set")
SAMPLED = ("a sampled loss over a large vocabulary: not implemented; sample negatives in the "
           "data (as PaddleRec's word2vec) or use softmax_with_cross_entropy")
RANDOM = ("a random-tensor op: not implemented in pyfleet's layer set (initializers draw "
          "parameters; dropout draws masks)")
MATH = ("not implemented in pyfleet's numpy layer set: no model of PaddleRec's zoo uses it "
        "(docs/layers.md lists the layers)")
SELECTED_ROWS = ("SelectedRows are internal to Fluid's executor: pyfleet's sparse gradients "
                 "go to the tables and never surface as tensors")
RULE = ("this update rule is not implemented in pyfleet's C++ tables: use SGD, Adam, Adagrad, "
        "Momentum, RMSProp or Ftrl")
MULTI_DEVICE = ("a GPU multi-device or large-batch optimizer (pipeline, recompute, DGC, LARS, "
                "LAMB): pyfleet trains on CPU workers, one place per process")
AVERAGE = ("pyfleet keeps no running average of parameters (ParamAttr's do_model_average "
           "therefore changes nothing)")
DEVICE_WORKER = ("Fluid's C++ trainers and device workers: pyfleet's "
                 "Executor.train_from_dataset runs the training loop itself")
BACKWARD = ("pyfleet derives gradients inside Executor.run from optimizer.minimize(loss): a "
            "program holds no gradient operators to append or fetch")
RUNTIME = "Fluid's C++ runtime (flags, custom operator libraries) does not exist in pyfleet"
PSLIB = ("PSLib (Baidu's closed parameter server): use "
         "parameter_server.distribute_transpiler's fleet, which pyfleet implements")
COLLECTIVE_GPU = ("a GPU collective-training helper of Fluid 1.8: pyfleet's collective mode "
                  "all-reduces on CPU workers (docs/collective.md)")
PROGRAM_TOOLS = ("Fluid's ProgramDesc debugging tools (graphviz, pruned-program checks) read "
                 "C++ program protobufs pyfleet does not build")
DATASET = ("a downloader of a public dataset from Paddle's servers: pyfleet ships no dataset "
           "downloaders (read files with fluid.io readers or pyfleet.data)")
WEIGHT_NORM = "weight normalization of parameters is not implemented"
ERROR_CLIP = ("clipping gradients of intermediate variables is not implemented: clip "
              "parameter gradients with GradientClipByValue/ByNorm/ByGlobalNorm")
FEED_DESC = ("DataFeedDesc configures Fluid's C++ data feed from a protobuf: give a "
             "dataset its variables with set_use_var")
HALF_ASYNC = ("the half-async communicator of Fluid 1.7+ is not implemented: use "
              "SyncStrategy, AsyncStrategy or GeoStrategy")
CONTRIB_LAYER = ("a contrib layer of Baidu's search and ads models: not part of pyfleet's "
                 "layer set")
QUANT = "quantization and model compression (slim) target GPU and mobile inference"
MEMORY = "pyfleet does not estimate a program's device memory"
OP_STATS = "pyfleet's programs have no Fluid op statistics to count"
DECOUPLED = ("decoupled weight decay (AdamW) is not an optimizer rule of pyfleet's tables; "
             "use regularization=L2Decay")
FLEET_UTIL = ("FleetUtil's helpers drive PSLib and HDFS jobs of Baidu's internal stack; "
              "use fleet's own save/load and fluid.metrics")

_GROUPS = {
    "paddle.fluid": {
        GPU: "CUDAPinnedPlace cuda_places cuda_pinned_places",
        DYGRAPH: "ComplexVariable VarBase enable_dygraph enable_imperative",
        DEVICE_WORKER: "TrainerDesc MultiTrainer DistMultiTrainer PipelineTrainer",
        "the pre-Fleet transpiler API (transpile, get_pserver_program, ...): use fleet "
        "(incubate.fleet.parameter_server.distribute_transpiler), which places parameters "
        "itself": "DistributeTranspiler",
        BACKWARD: "append_backward gradients backward",
        RUNTIME: "get_flags set_flags load_op_library",
        WEIGHT_NORM: "WeightNormParamAttr",
        FEED_DESC: "DataFeedDesc",
    },
    "paddle.fluid.layers": {
        VISION: "adaptive_pool2d adaptive_pool3d affine_channel affine_grid anchor_generator "
                "bipartite_match box_clip box_coder box_decoder_and_assign "
                "collect_fpn_proposals conv2d_transpose conv3d conv3d_transpose "
                "deformable_conv deformable_roi_pooling density_prior_box detection_output "
                "distribute_fpn_proposals fsp_matrix generate_mask_labels "
                "generate_proposal_labels generate_proposals grid_sampler group_norm "
                "im2sequence image_resize image_resize_short inplace_abn instance_norm "
                "interpolate iou_similarity locality_aware_nms lrn matrix_nms mean_iou "
                "multi_box_head multiclass_nms pixel_shuffle polygon_box_transform pool2d "
                "pool3d prior_box prroi_pool psroi_pool random_crop resize_bilinear "
                "resize_nearest resize_trilinear retinanet_detection_output "
                "retinanet_target_assign roi_align roi_perspective_transform roi_pool "
                "rpn_target_assign shuffle_channel similarity_focus space_to_depth "
                "ssd_loss target_assign temporal_shift unfold yolo_box yolov3_loss pad2d "
                "spectral_norm maxout affine_grid",
        CONTROL: "While IfElse Switch StaticRNN DynamicRNN cond case switch_case while_loop "
                 "create_array array_read array_write array_length tensor_array_to_tensor "
                 "reorder_lod_tensor_by_rank is_empty Print py_func load",
        RNN: "dynamic_lstm dynamic_lstmp gru_unit lstm lstm_unit rnn RNNCell "
             "GRUCell LSTMCell row_conv",
        NLP: "BasicDecoder BeamSearchDecoder DecodeHelper Decoder GreedyEmbeddingHelper "
             "SampleEmbeddingHelper TrainingHelper dynamic_decode beam_search "
             "beam_search_decode gather_tree linear_chain_crf crf_decoding chunk_eval "
             "ctc_greedy_decoder warpctc edit_distance add_position_encoding",
        SEQ: "sequence_concat sequence_conv sequence_enumerate sequence_expand "
             "sequence_expand_as sequence_mask sequence_pad sequence_reshape "
             "sequence_reverse sequence_scatter sequence_slice sequence_softmax "
             "sequence_unpad lod_append lod_reset",
        DIST: "Categorical MultivariateNormalDiag Normal Uniform",
        SAMPLED: "nce hsigmoid sampled_softmax_with_cross_entropy",
        RANDOM: ""
                "randint randn randperm sampling_id",
        SELECTED_ROWS: "get_tensor_from_selected_rows merge_selected_rows",
        MATH: "allclose "
              "bilinear_tensor_product center_loss clamp clip_by_norm "
              "crop crop_tensor cross diag diag_embed dice_loss dist "
              ""
              "filter_by_instag gather_nd "
              "hash index_sample "
              "kldiv_loss kron "
              "meshgrid multiplex "
              "npair_loss pad pad_constant_like "
              "scatter scatter_nd scatter_nd_add "
              "sigmoid_focal_loss "
              "strided_slice "
              "teacher_student_sigmoid_loss trace "
              "",
        "linear_lr_warmup wraps another schedule; pyfleet's schedules drive SGD alone "
        "(fluid.layers.exponential_decay, ...)": "linear_lr_warmup",
    },
    "paddle.fluid.optimizer": {
        RULE: "Adadelta AdadeltaOptimizer Adamax AdamaxOptimizer DecayedAdagrad "
              "DecayedAdagradOptimizer Dpsgd DpsgdOptimizer",
        MULTI_DEVICE: "DGCMomentumOptimizer LambOptimizer LarsMomentum "
                      "LarsMomentumOptimizer PipelineOptimizer RecomputeOptimizer "
                      "LookaheadOptimizer",
        AVERAGE: "ExponentialMovingAverage ModelAverage",
    },
    "paddle.fluid.clip": {ERROR_CLIP: "ErrorClipByValue"},
    "paddle.fluid.io": {
        "a program's state lives in pyfleet's tables (sparse ones included), not in one dict "
        "of arrays: use fluid.save / fluid.load, or save_persistables / load_persistables":
            "load_program_state set_program_state",
    },
    "paddle.fluid.initializer": {
        "pyfleet's initializers are drawn in the C++ tables from a kind and its "
        "parameters: set a pretrained value with global_scope().find_var(name)."
        "get_tensor().set(array, place) after the startup program": "NumpyArrayInitializer",
        VISION: "Bilinear BilinearInitializer",
    },
    "paddle.fluid.metrics": {VISION: "DetectionMAP"},
    "paddle.fluid.nets": {
        VISION: "simple_img_conv_pool img_conv_group",
        SEQ: "sequence_conv_pool",
    },
    "paddle.fluid.contrib": {
        RNN: "BasicLSTMUnit basic_lstm BasicGRUUnit basic_gru InitState StateCell "
             "TrainingDecoder BeamSearchDecoder decoder",
        QUANT: "QuantizeTranspiler quantize slim Compressor Calibrator int8_inference",
        MEMORY: "memory_usage memory_usage_calc",
        OP_STATS: "op_freq_statistic op_frequence summary model_stat",
        DECOUPLED: "extend_with_decoupled_weight_decay extend_optimizer",
        "fluid.contrib.reader's ctr_reader and distributed_batch_reader are C++ readers; "
        "use fluid.DatasetFactory or pyfleet.data": "reader ctr_reader",
        "use fleet.split_files to give each worker its files": "distributed_batch_reader",
        "fluid.contrib.trainer (the high-level Trainer API) was removed in Fluid 1.6; use "
        "Executor.run": "trainer",
        "fluid.contrib.inferencer was removed in Fluid 1.6; use "
        "fluid.io.load_inference_model": "inferencer",
        CONTRIB_LAYER: "sequence_topk_avg_pooling var_conv_2d match_matrix_tensor "
                       "tree_conv fused_elemwise_activation search_pyramid_hash "
                       "partial_concat partial_sum tdm_child tdm_sampler rank_attention "
                       "batch_fc correlation bilateral_slice",
        VISION: "multiclass_nms2",
    },
    "paddle.fluid.incubate.fleet.collective": {
        COLLECTIVE_GPU: "CollectiveOpBasedOptimizer DistFCConfig LambConfig TrainStatus",
    },
    "paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy":
        {HALF_ASYNC: "HalfAsyncStrategy"},
    "paddle.fluid.incubate.fleet.parameter_server.pslib": {
        PSLIB: "PSLib fleet DownpourOptimizer",
    },
    "paddle.fluid.incubate.fleet.utils.fleet_util": {FLEET_UTIL: "FleetUtil"},
    "paddle.fluid.incubate.fleet.utils.utils": {
        PROGRAM_TOOLS: "check_pruned_program_vars check_saved_vars_try_dump graphviz "
                       "load_program parse_program program_type_trans save_program",
    },
    "paddle.dataset": {
        DATASET: "cifar conll05 flowers image imdb imikolov mnist movielens mq2007 sentiment "
                 "uci_housing voc2012 wmt14 wmt16",
    },
}

REFUSED = {module: {name: reason for reason, names in groups.items()
                    for name in names.split()}
           for module, groups in _GROUPS.items()}


def _error(path, reason, attr=None):
    what = path if attr is None else f"{path}.{attr}"
    return UnsupportedError(f"{what} is not supported by pyfleet: {reason}")


def refuse(module, name):
    """The error for Fluid's ``module.name`` (``module`` as ``paddle.fluid.layers``)."""
    return _error(_short(module, name), REFUSED[module][name])


def _short(module, name):
    return f"{module.removeprefix('paddle.')}.{name}"


class _Refused(type):
    """Metaclass of the placeholders: every use raises the refusal."""

    def __new__(mcs, name, bases, ns, **kw):
        for b in bases:
            if isinstance(b, _Refused):
                raise _error(b._fluid_path, b._fluid_reason, None)
        return super().__new__(mcs, name, bases, ns)

    def __call__(cls, *args, **kwargs):
        raise _error(cls._fluid_path, cls._fluid_reason)

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise _error(cls._fluid_path, cls._fluid_reason, attr)

    def __instancecheck__(cls, obj):
        return False

    def __subclasscheck__(cls, sub):
        return sub is cls

    def __repr__(cls):
        return f"<{cls._fluid_path}: refused by pyfleet ({cls._fluid_reason})>"


def placeholder(path, reason):
    """A stand-in for Fluid's ``path`` whose every use raises the refusal."""
    return type.__new__(_Refused, path.rpartition(".")[2], (),
                        {"_fluid_path": path, "_fluid_reason": reason,
                         "__doc__": f"Refused by pyfleet: {reason}"})


def is_refused(obj):
    """Whether ``obj`` is a refusal placeholder."""
    return isinstance(obj, _Refused)


def install(namespace, module, shown_as=None):
    """Put a placeholder into ``namespace`` (a module's ``globals()``) for every
    refused name of Fluid's ``module`` it does not define; errors name it as
    ``shown_as.name`` (default ``module.name``)."""
    for name, reason in REFUSED.get(module, {}).items():
        if name not in namespace:
            namespace[name] = placeholder(_short(shown_as or module, name), reason)


def refused_module_getattr(module, reason):
    """A module ``__getattr__`` refusing every public name (a wholly refused
    Fluid module, e.g. ``fluid.dygraph``)."""
    def __getattr__(name):
        if name.startswith("_"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return placeholder(_short(module, name), reason)
    return __getattr__
