"""Shared test settings: one torch thread (the CI machine has two cores)."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)
