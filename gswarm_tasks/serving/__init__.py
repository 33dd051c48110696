"""What a node serves: engine presets, replica processes and their warm starter, the built-in model
server, generation.
"""
