"""brats_seg.tracking"""
