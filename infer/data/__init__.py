"""Reading data: HDF5 and MNIST files opened and checked (loader, dataset, mnist), read by native
threads or h5py (reader, native, read_pool/, h5py_workers), float32 files of 8-bit pixels as their
codes (codes), host buffers and the streaming ring (host), the bundled files (defaults), and files
written whole (predictions, atomic)."""
