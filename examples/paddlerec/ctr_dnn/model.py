"""A CTR DNN in PaddleRec 1.8.5's model interface (pyfleet's example, and its tests' model)
(``paddlerec.core.model.ModelBase``), importing ``paddle`` as PaddleRec models
do: run by ``paddlerec.run`` under ``pyfleet run``.

Every sparse slot (but ``click``, the label) is looked up in one shared
embedding table and sum-pooled; with the dense slot they feed two fc layers
and a 2-way softmax. Metrics: ``LOSS`` (the mean cross-entropy), ``AUC``,
``BATCH_AUC``. ``hyper_parameters.batch_norm: true`` adds a batch_norm layer
(pyfleet refuses it under Fleet, by name).
"""

import paddle.fluid as fluid
from paddlerec.core.model import ModelBase
from paddlerec.core.utils import envs


class Model(ModelBase):
    def __init__(self, config):
        ModelBase.__init__(self, config)

    def _init_hyper_parameters(self):
        get = envs.get_global_env
        self.vocab = get("hyper_parameters.sparse_feature_number", 1000)
        self.dim = get("hyper_parameters.sparse_feature_dim", 4)
        self.hidden = get("hyper_parameters.hidden", 16)
        self.batch_norm = get("hyper_parameters.batch_norm", False)

    def net(self, inputs, is_infer=False):
        label = self._sparse_data_var[0]
        pooled = []
        for slot in self._sparse_data_var[1:]:
            emb = fluid.layers.embedding(input=slot, size=[self.vocab, self.dim], is_sparse=True,
                                         param_attr=fluid.ParamAttr(name="slot_emb"))
            pooled.append(fluid.layers.sequence_pool(emb, pool_type="sum"))
        h = fluid.layers.concat(pooled + self._dense_data_var, axis=1)
        if self.batch_norm:
            h = fluid.layers.batch_norm(h)
        h = fluid.layers.fc(h, self.hidden, act="relu")
        self.predict = fluid.layers.fc(h, 2, act="softmax")
        # the prediction under a name of ours: the inference model's fetch variable
        fluid.layers.assign(self.predict, fluid.layers.create_tensor("float32", "ctr_prob"))
        cost = fluid.layers.cross_entropy(input=self.predict, label=label)
        self._cost = fluid.layers.reduce_mean(cost)
        auc, batch_auc, _ = fluid.layers.auc(input=self.predict, label=label)
        self._metrics["LOSS"] = self._cost
        self._metrics["AUC"] = auc
        self._metrics["BATCH_AUC"] = batch_auc
        if is_infer:
            self._infer_results["AUC"] = auc
