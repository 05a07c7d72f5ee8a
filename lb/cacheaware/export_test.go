package cacheaware

// BenchPickerPick lets the external test package benchmark with a setup.
var BenchPickerPick = benchPickerPick
