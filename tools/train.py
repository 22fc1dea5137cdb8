"""Train cnninfer's default weights on MNIST (a development tool: needs PyTorch, CPU is enough).

The network is the engine's, exactly: conv 5x5 1->32, ReLU, 2x2 average pool, conv 5x5 32->64,
ReLU, 2x2 average pool, flatten in (h, w, c) order, fc 1024->128, ReLU, fc 128->10; no biases.
Inputs are the data format's pixels (uint8 * float32(1/255)), no normalisation, so the weights
work on any file `cnninfer convert-mnist` writes.

    python tools/train.py ../shared/data/mnist models/cnninfer-mnist.hdf5

Seeded; the weights are written whole in the model format (conv (K, K, C_in, C_out), fc (in, out)).
"""
import argparse
import time
from pathlib import Path

import torch
from torch import nn

from infer.data import mnist
from infer.data.atomic import replacing


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, bias=False)
        self.conv2 = nn.Conv2d(32, 64, 5, bias=False)
        self.fc1 = nn.Linear(1024, 128, bias=False)
        self.fc2 = nn.Linear(128, 10, bias=False)

    def forward(self, x):  # x: NCHW
        x = nn.functional.avg_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.avg_pool2d(torch.relu(self.conv2(x)), 2)
        x = x.permute(0, 2, 3, 1).flatten(1)  # the engine flattens NHWC: (h, w, c)
        return self.fc2(torch.relu(self.fc1(x)))


def shifted(x, generator, pixels=2):
    """Each image moved by a random whole-pixel offset in [-pixels, pixels] (zero fill)."""
    n, _, h, w = x.shape
    padded = nn.functional.pad(x, (pixels,) * 4)
    dy, dx = torch.randint(0, 2 * pixels + 1, (2, n), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, None, :, None].expand(n, 1, h, w + 2 * pixels)
    cols = (dx[:, None] + torch.arange(w))[:, None, None, :].expand(n, 1, h, w)
    return padded.gather(2, rows).gather(3, cols)


def accuracy(net, x, y):
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mnist_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=408)
    a = p.parse_args()

    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    d = a.mnist_dir

    def tensors(kind):
        x, y = mnist.load(d / f"{kind}-images-idx3-ubyte.gz", d / f"{kind}-labels-idx1-ubyte.gz")
        return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y.argmax(1))

    xtr, ytr = tensors("train")
    xte, yte = tensors("t10k")
    net = Net()
    steps = a.epochs * (len(xtr) // a.batch)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=steps)
    start = time.time()
    for epoch in range(a.epochs):
        net.train()
        order = torch.randperm(len(xtr), generator=gen)
        for i in range(len(xtr) // a.batch):
            idx = order[i * a.batch:(i + 1) * a.batch]
            loss = nn.functional.cross_entropy(net(shifted(xtr[idx], gen)), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        net.eval()
        print(f"epoch {epoch + 1}/{a.epochs}  loss {loss.item():.4f}  "
              f"test accuracy {accuracy(net, xte, yte):.4f}  {time.time() - start:.0f} s", flush=True)

    import h5py
    with replacing(a.out) as tmp, h5py.File(tmp, "w") as f:
        f["conv1"] = net.conv1.weight.detach().permute(2, 3, 1, 0).numpy()
        f["conv2"] = net.conv2.weight.detach().permute(2, 3, 1, 0).numpy()
        f["fc1"] = net.fc1.weight.detach().T.numpy().copy()
        f["fc2"] = net.fc2.weight.detach().T.numpy().copy()
    print(f"wrote {a.out}; {time.time() - start:.0f} s in all")


if __name__ == "__main__":
    main()
