"""brats_seg.model"""
