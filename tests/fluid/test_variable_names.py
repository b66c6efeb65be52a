"""Variables and parameters are named by Fluid 1.8's rules (its LayerHelper and
unique_name), so fetch lists, inference models and checkpoints written against
Fluid's names (PaddleRec's ``save_inference_fetch_varnames``) find them.

The expected names are those Fluid 1.8.5 gives the same network (read off its
layer code: ``LayerHelper(layer_type)`` names a call ``<name or type_k>``, its
variables ``<call>.tmp_<n>`` in the order the layer makes them, its parameters
``<call>.w_<n>``/``.b_<n>``; Variable arithmetic makes ``tmp_<n>``).
"""

import pytest

import pyfleet.fluid as fluid


@pytest.fixture
def build():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        yield main.global_block()


def test_fc_named_and_unnamed(build):
    x = fluid.data("x", [-1, 8], "float32")
    out = fluid.layers.fc(x, 4, act="relu", name="l3")
    assert out.name == "l3.tmp_2"      # mul, bias add, activation
    assert {"l3.w_0", "l3.b_0", "l3.tmp_0", "l3.tmp_1"} <= set(build.vars)
    plain = fluid.layers.fc(x, 4)
    assert plain.name == "fc_0.tmp_1"
    two = fluid.layers.fc([x, x], 2, act="tanh")
    # two weights of one call, their sum, the bias add, the activation
    assert {"fc_1.w_0", "fc_1.w_1", "fc_1.b_0"} <= set(build.vars)
    assert two.name == "fc_1.tmp_4"
    again = fluid.layers.fc(x, 4, name="l3")     # a second call of the same name
    assert again.name == "l3.tmp_4"
    assert {"l3.w_1", "l3.b_1"} <= set(build.vars)


def test_unnamed_layers_count_per_type(build):
    q = fluid.data("q", [-1, 4], "float32")
    d = fluid.data("d", [-1, 4], "float32")
    assert fluid.layers.cos_sim(q, d).name == "cos_sim_0.tmp_0"
    assert fluid.layers.cos_sim(q, d).name == "cos_sim_1.tmp_0"
    assert fluid.layers.softmax(q).name == "softmax_0.tmp_0"
    assert fluid.layers.concat([q, d], axis=1).name == "concat_0.tmp_0"
    assert fluid.layers.reshape(q, [-1, 2, 2]).name == "reshape2_0.tmp_0"
    assert fluid.layers.reduce_sum(q, dim=1).name == "reduce_sum_0.tmp_0"
    assert fluid.layers.mean(q).name == "mean_0.tmp_0"
    values, indices = fluid.layers.topk(q, 2)
    assert (values.name, indices.name) == ("top_k_0.tmp_0", "top_k_0.tmp_1")
    assert fluid.layers.elementwise_add(q, d, act="relu").name == "elementwise_add_0.tmp_1"
    assert fluid.layers.square_error_cost(q, d).name == "square_error_cost_0.tmp_1"


def test_name_is_the_call_or_the_output_as_in_fluid(build):
    q = fluid.data("q", [-1, 4], "float32")
    # elementwise ops, scale and clip name their output itself
    assert fluid.layers.elementwise_mul(q, q, name="prod").name == "prod"
    assert fluid.layers.scale(q, 2.0, name="twice").name == "twice"
    assert fluid.layers.clip(q, -1.0, 1.0, name="clipped").name == "clipped"
    # most layers name the call: the output is <name>.tmp_0
    assert fluid.layers.sigmoid(q, name="sig").name == "sig.tmp_0"
    assert fluid.layers.reduce_mean(q, name="rm").name == "rm.tmp_0"
    assert fluid.layers.transpose(q, [1, 0], name="tr").name == "tr.tmp_0"


def test_embedding_and_parameters(build):
    ids = fluid.data("ids", [-1, 1], "int64")
    emb = fluid.layers.embedding(ids, [10, 4], is_sparse=True)
    assert emb.name == "embedding_0.tmp_0"
    assert "embedding_0.w_0" in build.vars
    named = fluid.layers.embedding(ids, [10, 4], param_attr="shared")
    assert named.name == "embedding_1.tmp_0" and "shared" in build.vars
    w = fluid.layers.create_parameter([3, 3], "float32")
    b = fluid.layers.create_parameter([3], "float32", is_bias=True)
    assert (w.name, b.name) == ("create_parameter_0.w_0", "create_parameter_1.b_0")
    assert fluid.layers.create_tensor("float32").name == "create_tensor_0"


def test_variable_arithmetic_makes_tmp_names(build):
    a = fluid.data("a", [-1, 4], "float32")
    assert (a + a).name == "tmp_0"
    assert (a * 2.0).name == "tmp_1"
    assert (1.0 / a).name == "tmp_3"     # the constant 1.0 is tmp_2


def test_guard_restarts_counters_and_prefixes():
    gen = fluid.unique_name.generate
    with fluid.unique_name.guard():
        assert (gen("fc"), gen("fc")) == ("fc_0", "fc_1")
        with fluid.unique_name.guard():
            assert gen("fc") == "fc_0"
        assert gen("fc") == "fc_2"      # the outer counters come back
    with fluid.unique_name.guard("A"):
        assert gen("fc") == "Afc_0"
    with fluid.unique_name.guard(b"B"):
        assert gen("fc") == "Bfc_0"


def test_switch_returns_the_previous_generator():
    gen = fluid.unique_name.generate
    with fluid.unique_name.guard():
        gen("fc")
        old = fluid.unique_name.switch()
        assert gen("fc") == "fc_0"
        fluid.unique_name.switch(old)
        assert gen("fc") == "fc_1"


def test_layer_helper_names_like_fluid(build):
    from pyfleet.fluid.layer_helper import LayerHelper
    helper = LayerHelper("my_metric")
    assert helper.name == "my_metric_0"
    assert helper.create_variable_for_type_inference("float32").name == "my_metric_0.tmp_0"
    assert helper.create_variable(dtype="float32").name.startswith("_generated_var_")
    assert LayerHelper("my_metric", name="m").name == "m"


def test_fetch_by_fluid_name_runs(build):
    import numpy as np
    x = fluid.data("x", [-1, 3], "float32")
    fluid.layers.fc(x, 2, act="relu", name="l3")
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fluid.default_startup_program())
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    pre, out = exe.run(build.program, feed={"x": xv}, fetch_list=["l3.tmp_1", "l3.tmp_2"])
    np.testing.assert_allclose(np.asarray(out), np.maximum(np.asarray(pre), 0.0))


def test_checkpoint_of_the_older_embedding_name_is_refused_with_the_reason(tmp_path):
    def net(param_attr):
        main, startup = fluid.Program(), fluid.Program()
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            ids = fluid.data("ids", [-1, 1], "int64")
            emb = fluid.layers.embedding(ids, [10, 4], param_attr=param_attr)
            fluid.layers.mean(emb)
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(startup)
        return main, exe

    old, exe = net("embedding_0")          # the name pyfleet 0.1 gave it
    fluid.io.save_persistables(exe, str(tmp_path), old)
    new, exe = net(None)                   # Fluid's: embedding_0.w_0
    with pytest.raises(ValueError, match=r"'embedding_0.w_0'.*unnamed embedding parameters "
                                          r"embedding_<k>, Fluid's name is embedding_0.w_0"):
        fluid.io.load_persistables(exe, str(tmp_path), new)


def test_normalization_layers_named_like_fluid(build):
    x = fluid.data("x", [-1, 4], "float32")
    y = fluid.layers.batch_norm(x, act="relu")
    assert {"batch_norm_0.w_0", "batch_norm_0.b_0", "batch_norm_0.w_1",
            "batch_norm_0.w_2"} <= set(build.vars)
    assert y.name == "batch_norm_0.tmp_3"    # SavedMean, SavedVariance, Y, the activation
    z = fluid.layers.layer_norm(x)
    assert z.name == "layer_norm_0.tmp_2"    # Mean, Variance, Y
    d = fluid.layers.data_norm(x)            # unnamed: Fluid's "dn" statistics
    assert {"dn.batch_size", "dn.batch_sum", "dn.batch_square_sum"} <= set(build.vars)
    assert d.name.startswith("_generated_var_")
