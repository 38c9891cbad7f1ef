"""Solutions of the workbook's exercises, one module per chapter (``chNN``), one function per
exercise named like its stub. Try the exercise first: the checker says what is wrong."""
