"""A tiny dataset for the CLI tests (`--dataset cli_dataset:DATASET`)."""
import torch

DATASET = [{"image": torch.zeros(3, 8, 8, dtype=torch.uint8), "label": i} for i in range(256)]
