"""What a host answers to the probes: a runtime that is not there, nvidia-smi's readings."""

NO_RUNTIME = "/nonexistent/podman"  # a host setting naming a runtime that is not there: no runtime answers


NVIDIA_SMI = """0, 97, 171234, 184320, 812.5, 71
1, 3, 2210, 184320, 140.25, 38
2, 55, 90000, 184320, 500.0, 60
3, [N/A], [N/A], 184320, [Not Supported], [N/A]
"""
