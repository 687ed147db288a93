"""Apple Metal through cffi and the Objective-C runtime (issue #20): no PyObjC, no Swift helper.

First slice: the Objective-C bridge (`objc.py`), the selector table it and the Linux mock share (`api.py`),
and the mock runtime (`mock/objc_fake.py`). No METAL device kind is registered yet. See docs/metal.md.
"""
