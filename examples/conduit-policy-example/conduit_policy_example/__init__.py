"""An example third-party Conduit policy package: ``nvme-hot-set`` (see :mod:`.policy`)."""

from conduit_policy_example.policy import HotSetPlacement, nvme_hot_set

__all__ = ["HotSetPlacement", "nvme_hot_set"]
