"""``sparse2d.comm_device``: flags and metrics go where the group's backend can move them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device


def test_without_a_process_group_flags_stay_on_the_cpu() -> None:
    assert not dist.is_initialized()
    assert flag_device() == torch.device("cpu")


def check_flag_device_on_gloo() -> list[str]:
    pair = dist.new_group([0, 1])
    devices = [flag_device(), flag_device(pair)]
    flag = torch.ones(1, device=devices[1])
    dist.all_reduce(flag, group=pair)  # the device it names works for the group
    dist.destroy_process_group(pair)
    if int(flag) != dist.get_world_size():
        raise AssertionError(f"all_reduce gave {int(flag)}")
    return [str(d) for d in devices]


def test_gloo_groups_take_cpu_flags(world2) -> None:
    assert world2.run(check_flag_device_on_gloo) == [["cpu", "cpu"]] * 2
