"""brats_seg.training"""
