"""Tests against a real control plane: etcd, kube-apiserver and KWOK on loopback."""
