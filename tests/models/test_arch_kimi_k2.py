"""kiln vs the independent PyTorch reference on a synthetic kimi_k2 checkpoint (F32): logits of a
64-token prompt and 32 greedy decode steps within 1e-3 relative error; see tests/reference/harness.py."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from harness import check_arch  # noqa: E402

sys.exit(check_arch("kimi_k2", min_experts=8))
