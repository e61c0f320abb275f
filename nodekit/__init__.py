"""The standalone scripts shipped to the GPU nodes: the pre-flight check and the split-trial kit (README.md).

They run on the node under a plain `python3`, with the standard library only at module level; nothing here imports
the portal's apps, and the apps import nothing from here but the shipped bytes.
"""
