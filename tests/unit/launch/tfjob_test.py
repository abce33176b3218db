"""Tests for tfdist.launch.tfjob: the Kubeflow manifest of a job."""

from __future__ import annotations

import yaml
from absl.testing import absltest
from absl.testing import parameterized

from tfdist import errors
from tfdist.launch import job
from tfdist.launch import tfjob


# The label the training operator puts on every pod of TFJob "my-job".
_MY_JOB_LABELS = {"training.kubeflow.org/job-name": "my-job"}


def _documents(text: str) -> dict[str, dict]:
    """The manifest's YAML documents by kind."""
    documents = list(yaml.safe_load_all(text))
    by_kind = {d["kind"]: d for d in documents}
    assert len(by_kind) == len(documents), "two documents of one kind"
    return by_kind


class TfjobManifestTest(parameterized.TestCase):
    def test_manifest_has_replica_specs_with_counts(self):
        manifest = _documents(
            tfjob.tfjob_manifest(
                ["python", "train.py", "--flag", 'it\'s "quoted"'],
                job.JobShape(3, num_ps=2, has_chief=True, has_evaluator=True),
                name="my-job",
                image="registry/me/train:1",
            )
        )["TFJob"]

        self.assertEqual(manifest["apiVersion"], "kubeflow.org/v1")
        self.assertEqual(manifest["kind"], "TFJob")
        self.assertEqual(manifest["metadata"]["name"], "my-job")
        replicas = manifest["spec"]["tfReplicaSpecs"]
        self.assertEqual(
            {name: r["replicas"] for name, r in replicas.items()},
            {"Chief": 1, "Worker": 3, "PS": 2, "Evaluator": 1},
        )
        for replica in replicas.values():
            self.assertEqual(replica["restartPolicy"], "OnFailure")
            (container,) = replica["template"]["spec"]["containers"]
            self.assertEqual(container["name"], "tensorflow")
            self.assertEqual(container["image"], "registry/me/train:1")
            self.assertEqual(
                container["command"],
                ["python", "train.py", "--flag", 'it\'s "quoted"'],
            )
        self.assertNotIn("runPolicy", manifest["spec"])

    def test_workers_only_manifest_has_defaults_and_run_policy(self):
        manifest = _documents(
            tfjob.tfjob_manifest(
                ["python", "train.py"],
                job.JobShape(2),
                restarts=3,
                timeout_s=90.5,
            )
        )["TFJob"]

        self.assertEqual(manifest["metadata"]["name"], tfjob.DEFAULT_TFJOB_NAME)
        self.assertEqual(list(manifest["spec"]["tfReplicaSpecs"]), ["Worker"])
        self.assertEqual(
            manifest["spec"]["runPolicy"],
            {"backoffLimit": 3, "activeDeadlineSeconds": 91},
        )

    def test_an_elastic_range_runs_max_replicas_and_says_why(self):
        text = tfjob.tfjob_manifest(["python", "train.py"], job.JobShape(4), min_workers=2)
        manifest = _documents(text)["TFJob"]
        self.assertEqual(manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"], 4)
        self.assertIn("# Elastic range 2:4 workers: a TFJob has no", text)
        self.assertNotIn("Elastic range", tfjob.tfjob_manifest(["python"], job.JobShape(4), min_workers=4))

    def test_network_policy_admits_only_the_jobs_own_pods(self):
        documents = _documents(
            tfjob.tfjob_manifest(
                ["python", "train.py"],
                job.JobShape(2, num_ps=1, has_chief=True, has_evaluator=True),
                name="my-job",
            )
        )

        self.assertEqual(list(documents), ["TFJob", "NetworkPolicy"])
        policy = documents["NetworkPolicy"]
        self.assertEqual(policy["apiVersion"], "networking.k8s.io/v1")
        self.assertEqual(policy["metadata"], {"name": "my-job-same-job-only"})
        # Applies to the job's pods, restricts ingress only (egress stays
        # open), and admits exactly one source: pods with the same labels.
        self.assertEqual(
            policy["spec"],
            {
                "podSelector": {"matchLabels": _MY_JOB_LABELS},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": _MY_JOB_LABELS}}]}
                ],
            },
        )
        # The selector matches every replica's pods, whichever operator
        # version sets (or does not set) the label itself.
        replicas = documents["TFJob"]["spec"]["tfReplicaSpecs"]
        self.assertLen(replicas, 4)
        for name, replica in replicas.items():
            labels = replica["template"]["metadata"]["labels"]
            self.assertContainsSubset(
                _MY_JOB_LABELS.items(), labels.items(), name
            )

    def test_network_policy_left_out_when_turned_off(self):
        text = tfjob.tfjob_manifest(
            ["python", "train.py"], job.JobShape(2), network_policy=False
        )

        self.assertEqual(list(_documents(text)), ["TFJob"])
        self.assertNotIn("---", text)

    @parameterized.named_parameters(
        ("upper_case_name", {"name": "MyJob"}, r"name='MyJob' is not a valid"),
        ("long_name", {"name": "a" * 64}, r"at most 63"),
        ("empty_image", {"image": ""}, r"image='' is not"),
        ("spaced_image", {"image": "a b"}, r"image='a b' is not"),
        ("empty_command", {"command": []}, r"command=\[\] is empty"),
    )
    def test_bad_argument_raises_launcher_error(self, overrides, pattern):
        kwargs = {"command": ["python", "x.py"], "shape": job.JobShape(1)}
        kwargs.update(overrides)
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            tfjob.tfjob_manifest(**kwargs)


if __name__ == "__main__":
    absltest.main()
