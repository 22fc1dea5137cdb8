"""The result of one run: predictions and labels, correctness per shard and per class, timing."""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Result:
    data_paths: list
    model_path: str
    shape: tuple  # (N, H, W, C) of the images used
    predictions: np.ndarray
    labels: np.ndarray
    backend: str
    device: str
    classes: int
    shards: list = field(default_factory=list)  # (file, first image, end) of each data file used
    scores: np.ndarray = None  # (N, classes) float32, when asked for
    timing: dict = field(default_factory=dict)  # milliseconds: load, prepare, forward (read, wait)
    profile: list = None
    streamed: bool = False  # read from the files block by block, overlapped with compute
    reader: dict = None  # the read path (layout) and reader threads
    recomputed: int = None  # a certified run: the images recomputed exactly (the rest float16, certified)
    plan: dict = None  # the run plan it ran (infer/plan.py's Plan.as_dict)

    @property
    def precision(self):
        """"certified" where the run took the certified float16 pass, else "exact"."""
        return "exact" if self.recomputed is None else "certified"

    @property
    def n(self):
        return len(self.predictions)

    @property
    def correct(self):
        return int(np.count_nonzero(self.predictions == self.labels))

    @property
    def accuracy(self):
        return self.correct / self.n

    @property
    def confusion(self):
        """(classes, classes) counts: row the true label, column the prediction."""
        m = np.zeros((self.classes, self.classes), np.int64)
        np.add.at(m, (self.labels, self.predictions), 1)
        return m

    def per_class(self):
        """Per true class: images, correct, accuracy (None without images), and the class its
        images are most often mistaken for (None when never)."""
        m = self.confusion
        rows = []
        for k in range(self.classes):
            images, correct = int(m[k].sum()), int(m[k, k])
            wrong = m[k].copy()
            wrong[k] = 0
            rows.append({"class": k, "n": images, "correct": correct,
                         "accuracy": correct / images if images else None,
                         "confused_with": int(np.argmax(wrong)) if wrong.any() else None})
        return rows

    def per_shard(self):
        out = []
        for path, lo, hi in self.shards:
            correct = int(np.count_nonzero(self.predictions[lo:hi] == self.labels[lo:hi]))
            out.append(dict(data=path, n=hi - lo, correct=correct, accuracy=correct / (hi - lo)))
        return out

    def as_dict(self):
        d = dict(n=self.n, correct=self.correct, accuracy=self.accuracy,
                 elapsed_ms=self.timing["forward"], backend=self.backend, device=self.device,
                 input_shape=list(self.shape),
                 data=self.data_paths[0] if len(self.data_paths) == 1 else list(self.data_paths),
                 model=self.model_path, streamed=self.streamed, precision=self.precision, timing_ms=dict(self.timing),
                 shards=self.per_shard(), per_class=self.per_class(), confusion=self.confusion.tolist())
        if self.reader is not None:
            d["reader"] = self.reader
        if self.profile is not None:
            d["profile"] = self.profile
        if self.recomputed is not None:
            d["recomputed"] = self.recomputed
        if self.plan is not None:
            d["plan"] = self.plan
        return d

    def per_class_table(self):
        lines = ["class  images  correct  accuracy  most often taken for"]
        for r in self.per_class():
            acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
            other = "-" if r["confused_with"] is None else str(r["confused_with"])
            lines.append(f"{r['class']:>5}  {r['n']:>6}  {r['correct']:>7}  {acc:>8}  {other}")
        return lines
