"""The foundation every floor may use: errors, file writing, input checks, names, the kinds of AWS failure."""
