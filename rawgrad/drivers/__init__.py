"""Device drivers. Importing this package makes every driver that can load register itself in the device
registry (`rawgrad.hcq.device.Device`); rawgrad/__init__.py imports it, so the registry is filled from the
top before anything looks a device up (hcq sits below the drivers and never imports them).

The CPU driver always loads. Accelerator drivers are optional: a driver package that is absent is skipped,
and one that fails to import is recorded in the registry (`Device.driver_errors`), so asking for that
device explains why it is missing instead of breaking every other device. A new driver adds its own `try`
block here (plain import statements, so tests/test_layering.py sees every edge).
"""
from rawgrad.drivers import cpu  # noqa: F401  (registers CPU)
from rawgrad.hcq.device import Device

try:
    import rawgrad.drivers.nv  # noqa: F401  (registers NV)
except ModuleNotFoundError as e:
    if e.name != "rawgrad.drivers.nv":  # the package is there but something it imports is not
        Device.record_driver_error("NV", e)
except Exception as e:  # a broken driver must not take the others down
    Device.record_driver_error("NV", e)

try:
    import rawgrad.drivers.amd  # noqa: F401  (registers AMD)
except ModuleNotFoundError as e:
    if e.name != "rawgrad.drivers.amd":
        Device.record_driver_error("AMD", e)
except Exception as e:
    Device.record_driver_error("AMD", e)

try:
    import rawgrad.drivers.metal  # noqa: F401  (registers METAL)
except ModuleNotFoundError as e:
    if e.name != "rawgrad.drivers.metal":
        Device.record_driver_error("METAL", e)
except Exception as e:
    Device.record_driver_error("METAL", e)
