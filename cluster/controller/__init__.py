"""The controller: the metadata image every node applies (image.py), the active
controller's decisions as a sans-IO object (controller.py), and its trio shell on top of
the quorum (service.py) that callers anywhere in the cluster reach (rpc.py)."""
