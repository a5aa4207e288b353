#!/usr/bin/python3
"""PyTorch's side of bench/image_folder_vs_pytorch.sh: the same MLP, optimizer, batch and thread
count as bench_image_folder, on torchvision's ImageFolder through DataLoader(num_workers=k)
(worker processes), on Debian's torch 1.13 and torchvision 0.14, the LibTorch Volt links.

Prints samples per second over the steps after --warmup, the time to the first step, and peak RSS:
the main process's and, with workers, the largest worker's (ru_maxrss of the reaped children).
"""
import argparse
import resource
import time

import torch
import torchvision
from torchvision import transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    start = time.monotonic()
    data = torchvision.datasets.ImageFolder(args.folder, transform=transforms.Compose([
        transforms.Grayscale(1), transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))]))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, num_workers=args.workers)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    stamps = []
    while len(stamps) < args.steps:
        for images, labels in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(images), labels).backward()
            optimizer.step()
            stamps.append(time.monotonic())
            if len(stamps) == args.steps:
                break
    del loader  # reaps the worker processes, so their peak RSS is counted
    first = min(args.warmup, args.steps - 1)
    samples = 64 * (args.steps - 1 - first)
    main_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"pytorch workers={args.workers} samples_per_s={samples / (stamps[-1] - stamps[first]):.1f} "
          f"first_step_ms={(stamps[0] - start) * 1000:.1f} peak_rss_mb={main_rss:.1f} "
          f"largest_worker_rss_mb={worker_rss:.1f}")


if __name__ == "__main__":
    main()
