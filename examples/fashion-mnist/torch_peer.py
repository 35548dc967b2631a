"""The same Fashion-MNIST recipe in PyTorch/torchvision, for comparison with rn:
ImageFolder over the JPEG folders the example makes, Resize(SIZE) + CenterCrop(SIZE) (what
rn-prep --resize --center-crop stores), then RandomResizedCrop(SIZE) + flip + ImageNet
normalisation for training and the identity for testing; SGD momentum 0.9, weight decay
1e-4, StepLR; batch; drop_last, as rn-train.
usage: torch_peer.py JPEG_DIR ARCH SIZE EPOCHS BATCH LR LR_STEP THREADS WORKERS
Prints one line per epoch and 'peer: top1=... seconds=...'."""
import sys
import time

import torch
import torchvision
from torchvision import transforms as T

root, arch = sys.argv[1], sys.argv[2]
size, epochs, batch = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
lr, lr_step, threads, workers = float(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
torch.set_num_threads(threads)
torch.manual_seed(0)
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
base = [T.Resize(size), T.CenterCrop(size)]
rgb = T.Lambda(lambda im: im.convert("RGB"))
train = torchvision.datasets.ImageFolder(f"{root}/train", T.Compose([rgb] + base + [
    T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), norm]))
test = torchvision.datasets.ImageFolder(f"{root}/test", T.Compose([rgb] + base + [T.ToTensor(), norm]))
tl = torch.utils.data.DataLoader(train, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers)
vl = torch.utils.data.DataLoader(test, batch_size=256, num_workers=workers)
model = getattr(torchvision.models, arch)(num_classes=len(train.classes))
opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.StepLR(opt, lr_step, 0.1)
t0 = time.time()
for epoch in range(epochs):
    model.train()
    for x, y in tl:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sched.step()
    model.eval()
    correct = n = 0
    with torch.no_grad():
        for x, y in vl:
            correct += (model(x).argmax(1) == y).sum().item()
            n += len(y)
    print(f"epoch {epoch + 1}: top1={correct / n:.4f} n={n} ({time.time() - t0:.0f} s)", flush=True)
print(f"peer: top1={correct / n:.4f} seconds={time.time() - t0:.0f}")
