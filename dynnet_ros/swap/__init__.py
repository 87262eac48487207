"""swap"""
