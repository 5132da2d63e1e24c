"""split12"""
