"""The era's criteo_reader.py (PaddleRec ctr/dnn), imports changed only: a
MultiSlotDataGenerator for Dataset pipes, and the plain Python reader infer
scripts fed through DataFeeder. Criteo TSV: label, I1..I13, C1..C26."""


import pyfleet.fluid.incubate.data_generator as dg

cont_min_ = [0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
cont_max_ = [20, 600, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50]
cont_diff_ = [cont_max_[i] - cont_min_[i] for i in range(13)]
hashid_range_ = 1000001
continuous_range_ = range(1, 14)
categorical_range_ = range(14, 40)


class CriteoDataset(dg.MultiSlotDataGenerator):

    def _process_line(self, line):
        features = line.rstrip('\n').split('\t')
        dense_feature = []
        sparse_feature = []
        for idx in continuous_range_:
            if features[idx] == "":
                dense_feature.append(0.0)
            else:
                dense_feature.append(
                    (float(features[idx]) - cont_min_[idx - 1]) / cont_diff_[idx - 1])
        for idx in categorical_range_:
            sparse_feature.append([hash(str(idx) + features[idx]) % hashid_range_])
        return dense_feature, sparse_feature, [int(features[0])]

    def test(self, filelist):
        def reader():
            for fname in filelist:
                with open(fname) as f:
                    for line in f:
                        dense_feature, sparse_feature, label = self._process_line(line)
                        yield [dense_feature] + sparse_feature + [label]
        return reader

    def generate_sample(self, line):
        def data_iter():
            dense_feature, sparse_feature, label = self._process_line(line)
            feature_name = ["dense_input"]
            for idx in categorical_range_:
                feature_name.append("C" + str(idx - 13))
            feature_name.append("label")
            yield zip(feature_name, [dense_feature] + sparse_feature + [label])
        return data_iter


if __name__ == "__main__":
    d = CriteoDataset()
    d.run_from_stdin()
