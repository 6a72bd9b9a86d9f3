#!/usr/bin/python3
"""Trains the Iris classifier that rebound's examples and tests serve, and writes it as TorchScript.

Uses Debian's packages only: python3-torch for training and TorchScript, and the Iris data set that
python3-sklearn ships (sklearn/datasets/data/iris.csv). Deterministic: the same packages give the
same model.pt.

    /usr/bin/python3 examples/models/iris/train.py [OUTPUT_DIR]
"""
import csv
import json
import os
import sys

import sklearn.datasets
import torch

out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
iris_csv = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "iris.csv")

with open(iris_csv) as f:
    rows = list(csv.reader(f))
labels = rows[0][2:5]  # the header: n_samples, n_features, class names
features = torch.tensor([[float(v) for v in r[:4]] for r in rows[1:]])
targets = torch.tensor([int(r[4]) for r in rows[1:]])


class IrisClassifier(torch.nn.Module):
    """Standardises the 4 raw measurements, then a small MLP; outputs class probabilities."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net((x - self.mean) / self.std), dim=1)


torch.manual_seed(0)
model = IrisClassifier(features.mean(0), features.std(0))
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
for epoch in range(300):
    optimizer.zero_grad()
    logits = model.net((features - model.mean) / model.std)
    loss = torch.nn.functional.cross_entropy(logits, targets)
    loss.backward()
    optimizer.step()

model.eval()
with torch.no_grad():
    accuracy = (model(features).argmax(1) == targets).float().mean().item()
print(f"training accuracy on the 150 rows: {accuracy:.3f}")
if accuracy < 0.9:
    sys.exit("accuracy below 0.9: not saving")

torch.jit.script(model).save(os.path.join(out_dir, "model.pt"))
config = {
    "name": "iris",
    "labels": labels,
    "input_shape": [4],
    "batching": {"max_batch_size": 32, "max_queue_delay_ms": 2},
}
with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
print(f"wrote {out_dir}/model.pt and config.json")
