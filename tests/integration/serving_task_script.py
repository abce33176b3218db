"""One worker or ps task of a parameter-server job, alone: `python serving_task_script.py` under TF_CONFIG.

The strategy's constructor serves on worker and ps tasks and never
returns (`tfdist.parameter_server.roles.serve`).
"""

import tfdist

if __name__ == "__main__":
    tfdist.ParameterServerStrategy(timeout_s=30)
