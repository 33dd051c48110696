"""What a node does with model weights: the model operations (download, copy, move, delete, stage), their
sources, the GPU holder.
"""
