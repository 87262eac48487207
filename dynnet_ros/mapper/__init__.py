"""mapper"""
