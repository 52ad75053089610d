"""Swap OpenEnv 0.10's server for envsdk's in every process of a test run (ENVSDK_SHIM=1):
openenv's create_app / create_fastapi_app / HTTPEnvServer build envsdk apps; the test bodies
are untouched. Used by run.sh beside it; not part of the envsdk package."""
import os

if os.environ.get("ENVSDK_SHIM") == "1":
    import openenv.core.env_server as _pkg
    import openenv.core.env_server.http_server as _hs
    from fastapi import FastAPI

    import envsdk.server as _es

    def _mode(mode):
        if mode is None:
            return None
        value = getattr(mode, "value", mode)
        if str(value).lower() not in ("simulation", "production"):
            raise ValueError(f"Invalid mode: '{mode}'. Must be one of: ['production', 'simulation']")
        return str(value).lower()

    def _build(env, action_cls, observation_cls, *, env_name=None, max_concurrent_envs=None, state_cls=None, mode=None):
        kwargs = {}
        if env_name:
            kwargs["env_name"] = env_name
        if max_concurrent_envs:
            kwargs["max_concurrent_envs"] = max_concurrent_envs
        if state_cls is not None:
            kwargs["state_type"] = state_cls
        m = _mode(mode)
        if m:
            kwargs["mode"] = m
        return _es.create_app(env, action_cls, observation_cls, **kwargs)

    def create_app(env, action_cls, observation_cls, env_name=None, max_concurrent_envs=None, concurrency_config=None,
                   gradio_builder=None, custom_tab_name="Custom", custom_tab_primary=False, show_default_tab=True,
                   title_override=None, state_cls=None, *, mode=None, **_ignored):
        if concurrency_config is not None and max_concurrent_envs is None:
            max_concurrent_envs = concurrency_config.max_concurrent_envs
        return _build(env, action_cls, observation_cls, env_name=env_name, max_concurrent_envs=max_concurrent_envs,
                      state_cls=state_cls, mode=mode)

    def create_fastapi_app(env, action_cls, observation_cls, max_concurrent_envs=None, concurrency_config=None,
                           env_name=None, state_cls=None, *, mode=None, **_ignored):
        if concurrency_config is not None and max_concurrent_envs is None:
            max_concurrent_envs = concurrency_config.max_concurrent_envs
        return _build(env, action_cls, observation_cls, env_name=env_name, max_concurrent_envs=max_concurrent_envs,
                      state_cls=state_cls, mode=mode)

    class HTTPEnvServer:
        def __init__(self, env, action_cls=None, observation_cls=None, max_concurrent_envs=None, concurrency_config=None, **_ignored):
            if not callable(env):
                raise TypeError(
                    f"env must be a callable (class or factory function), got {type(env)}. "
                    f"Pass the environment class (e.g., MyEnvironment) not an instance (e.g., MyEnvironment())."
                )
            if concurrency_config is not None and max_concurrent_envs is None:
                max_concurrent_envs = concurrency_config.max_concurrent_envs
            self._args = (env, action_cls, observation_cls, max_concurrent_envs)

        def register_routes(self, app: FastAPI, mode=None):
            env, action_cls, observation_cls, n = self._args
            built = _build(env, action_cls, observation_cls, max_concurrent_envs=n, mode=mode)
            app.router.routes.extend(built.router.routes)
            for key, value in vars(built.state)["_state"].items():
                setattr(app.state, key, value)
            app.router.lifespan_context = built.router.lifespan_context

    for module in (_hs, _pkg):
        module.create_app = create_app
        module.create_fastapi_app = create_fastapi_app
        module.HTTPEnvServer = HTTPEnvServer
