"""A tiny Hugging Face accelerate CPU job (the same under torchrun and aioelastic run); the
main process saves the trained weights to argv[1]."""

import sys

import torch
from accelerate import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for _ in range(2):
        for inputs, targets in data:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), sys.argv[1])


if __name__ == "__main__":
    main()
