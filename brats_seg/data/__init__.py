"""brats_seg.data"""
