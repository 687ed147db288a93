"""Device drivers. Importing this package lets every driver that can load register itself.

The CPU driver always loads. Accelerator drivers are optional: a driver package that is absent is
skipped, and one that fails to import is recorded in the registry (`Device.driver_errors`) so asking
for that device explains why it is missing instead of breaking every other device.
"""
import importlib

from rawgrad.hcq.device import Device

from . import cpu  # noqa: F401  (registers CPU)

# Optional drivers, by device kind and package name.
OPTIONAL_DRIVERS = {"NV": "nv", "AMD": "amd", "METAL": "metal"}

for _kind, _pkg in OPTIONAL_DRIVERS.items():
    _module = f"{__name__}.{_pkg}"
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as e:
        if e.name != _module:
            Device.record_driver_error(_kind, e)
    except Exception as e:  # a broken driver must not take the others down
        Device.record_driver_error(_kind, e)
