// A real OpenID Provider for the tests: `oidc-provider` (a certified implementation) on loopback, with two
// people in different groups and organisations, the panel's confidential client (authorization code + PKCE,
// RP-initiated logout) and the CLI's public client (device authorization grant, refresh tokens).
// Configured by environment variables (tests/support/oidc.py sets them):
//   OIDC_MODULE   the installed package's entry point (an absolute path)
//   OIDC_PORT     the port to listen on (127.0.0.1)
//   OIDC_CONFIG   JSON: {"jwks": {"keys": [private JWK, ...]}, "panel_secret": str,
//                        "redirect_uris": [...], "post_logout_redirect_uris": [...]}
// Sign-in pages are the provider's own development interactions: any password, the login names a user below.
import { pathToFileURL } from 'node:url';

const { default: Provider } = await import(pathToFileURL(process.env.OIDC_MODULE).href);
const config = JSON.parse(process.env.OIDC_CONFIG);
const port = Number(process.env.OIDC_PORT);
const issuer = `http://127.0.0.1:${port}`;

const USERS = {
  olga: { name: 'Olga Operator', preferred_username: 'olga', groups: ['teto-operators', 'staff'], org: 'radiology' },
  vic: { name: 'Vic Viewer', preferred_username: 'vic', groups: ['teto-viewers', 'staff'], org: 'cardiology' },
  nobody: { name: 'No Group', preferred_username: 'nobody', groups: ['staff'], org: 'radiology' },
};

const provider = new Provider(issuer, {
  jwks: config.jwks,
  clients: [
    {
      client_id: 'teto-panel',
      client_secret: config.panel_secret,
      redirect_uris: config.redirect_uris,
      post_logout_redirect_uris: config.post_logout_redirect_uris,
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    {
      client_id: 'teto-cli',
      token_endpoint_auth_method: 'none',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'refresh_token'],
      response_types: [],
      redirect_uris: [],
    },
  ],
  scopes: ['openid', 'offline_access', 'profile', 'groups', 'org'],
  claims: { openid: ['sub'], profile: ['name', 'preferred_username'], groups: ['groups'], org: ['org'] },
  conformIdTokenClaims: false, // the scopes' claims in the ID token itself, as Keycloak and Entra ID do
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    revocation: { enabled: true },
  },
  pkce: { required: () => true },
  async findAccount(ctx, id) {
    const user = USERS[id];
    if (!user) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...user }; } };
  },
  async issueRefreshToken(ctx, client) {
    return client.grantTypeAllowed('refresh_token');
  },
  ttl: { IdToken: 3600, AccessToken: 3600, DeviceCode: 600, Session: 3600, Interaction: 600, Grant: 3600,
         RefreshToken: 86400 },
});
provider.on('server_error', (ctx, err) => console.error('server_error', err));
provider.on('end_session.error', (ctx, err) => console.error('end_session.error', err, err.cause));
provider.listen(port, '127.0.0.1', () => console.log(`oidc-provider listening on ${issuer}`));
