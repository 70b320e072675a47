#!/usr/bin/env python3
# examples/oci_net.py: the CIFAR tutorial's Net written as PyTorch users write it (a kiln.nn.Module, .to(device), loss.backward(), optimizer.step(), state_dict), trained on Fashion-MNIST on any kiln device.
"""The tutorial's network, moved to whatever device kiln has.

The GPU tutorial trains a small CNN on CIFAR-10 with ``net.to(device)``,
``loss.backward()`` and ``optimizer.step()``, then saves ``net.state_dict()``
and loads it into a fresh ``Net`` to test it. This is that script for kiln,
line for line, on Fashion-MNIST (1x28x28 images, so ``conv1`` takes one
channel and ``fc1`` 16*4*4 inputs):

    python3 examples/oci_net.py                          # kiln's default device
    python3 examples/oci_net.py --device opencl:0 --steps 2000
"""
import argparse
import os
import sys
import tempfile
import time

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


def train(net, loader, epochs, max_steps, lr, report_every, log=print):
    """The tutorial's loop; returns (steps, images, seconds, last running loss)."""
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    steps = images = 0
    last = float("nan")
    start = time.perf_counter()
    for epoch in range(epochs):
        running_loss = 0.0
        for i, (inputs, labels) in enumerate(loader):
            optimizer.zero_grad()
            outputs = net(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            steps += 1
            images += labels.shape[0]
            if (i + 1) % report_every == 0:
                last = running_loss / report_every
                log("[%d, %5d] loss: %.3f" % (epoch + 1, i + 1, last))
                running_loss = 0.0
            if max_steps and steps >= max_steps:
                return steps, images, time.perf_counter() - start, last
    return steps, images, time.perf_counter() - start, last


def test(net, loader):
    correct = total = 0
    with kiln.no_grad():
        for images, labels in loader:
            outputs = net(images)
            _, predicted = kiln.max(outputs.data, 1)
            total += labels.shape[0]
            correct += int((predicted == labels).sum().item())
    return correct / total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="a selector such as cpu:0 or opencl:0 (default: kiln's default)")
    p.add_argument("--epochs", type=int, default=2, help="passes over the training set (the tutorial's 2)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the whole epochs)")
    p.add_argument("--batch", type=int, default=4, help="images per step (the tutorial's 4)")
    p.add_argument("--lr", type=float, default=0.001, help="SGD's learning rate, momentum 0.9 (the tutorial's)")
    p.add_argument("--report", type=int, default=2000, help="print the running loss every N steps")
    p.add_argument("--test-limit", type=int, default=0, help="test on the first N test images only")
    p.add_argument("--save", default=None, help="where to save the state_dict (default: a temporary file)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    device = kiln.device(args.device)
    print("device:", device)
    try:
        trainset = nn.FashionMNIST("train")
        testset = nn.FashionMNIST("test")
    except kiln.Error as e:
        sys.exit(f"oci_net.py: {e}")
    if args.test_limit:
        pixels, labels = testset.arrays()
        testset = nn.Dataset.from_arrays(pixels[:args.test_limit], labels[:args.test_limit], testset.classes)
    trainloader = nn.Loader(trainset, device, batch_size=args.batch, shuffle=True, seed=args.seed)
    testloader = nn.Loader(testset, device, batch_size=100, shuffle=False)

    net = Net()
    net.to(device)
    steps, images, seconds, last = train(net, trainloader, args.epochs, args.steps, args.lr, args.report)
    print("Finished Training: %d steps, %d images in %.2f s, %.0f images/s" % (steps, images, seconds,
                                                                              images / seconds))

    trained = test(net, testloader)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.save or os.path.join(tmp, "oci_net.safetensors")
        nn.save_safetensors(path, net.state_dict())
        net = Net().to(device)
        net.load_state_dict(nn.load_safetensors(path, device))
        accuracy = test(net, testloader)
    print("Accuracy of the network on the %d test images: %.2f %% (%.2f %% before saving and reloading)"
          % (len(testset), 100 * accuracy, 100 * trained))
    return 0


if __name__ == "__main__":
    sys.exit(main())
