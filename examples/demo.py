"""The main demo. Placeholder until the store and agent land; replaced by `aioelastic run`."""

print("aioelastic demo: nothing to show yet")
